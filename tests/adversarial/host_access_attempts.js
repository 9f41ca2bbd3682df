// Nothing of the host is reachable: no module loader, no std/os, no process, no print, no timers.
const out = {};
for (const name of ["require", "process", "std", "os", "print", "scriptArgs", "setTimeout", "setInterval",
                    "fetch", "Deno", "Bun", "module", "exports", "XMLHttpRequest", "WebAssembly", "navigator",
                    "__loadScript", "load", "read", "readFile", "quit", "gc"]) {
  out[name] = typeof globalThis[name];
}
for (const spec of ["std", "os", "./x.js", "/etc/passwd", "node:fs"]) {
  try { await import(spec); out["import " + spec] = "imported!"; } catch (e) { out["import " + spec] = e.name + ": " + e.message; }
}
try { out.requireCall = String(require("fs")); } catch (e) { out.requireCall = e.name; }
const ia = new Int32Array(new SharedArrayBuffer(4));
try { out.atomicsWait = String(Atomics.wait(ia, 0, 0, 3000)); } catch (e) { out.atomicsWait = e.name + ": " + e.message; }
return out;
