// If the prelude's private `call` leaks, a program can queue a call whose "name" is not a
// string; the host must refuse it as data, never raise.
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
const r = {};
try { r.secret = await callFn("secret", {}); } catch (e) { r.secret = e.message; }
try { r.weird = await callFn(["not", "a", "name"], {}); } catch (e) { r.weird = e.message; }
return r;
