// If the prelude's private `call` leaks, a program can queue a call whose name has no JSON
// spelling (a Symbol): drain() then emits `undefined` into the envelope, which the host must
// still handle as data, never as a Python exception.
let callFn;
try {
  Error.prepareStackTrace = (e, sites) => {
    for (const s of sites) { const f = s.getFunction(); if (f && f.name === "call") callFn = f; }
    return "";
  };
} catch (e) {}
await tools.echo({ toJSON() { new Error().stack; return {}; } });
try { Error.prepareStackTrace = undefined; } catch (e) {}
if (typeof callFn !== "function") return "call not reachable";
callFn(Symbol("x"), {});
return "queued";
