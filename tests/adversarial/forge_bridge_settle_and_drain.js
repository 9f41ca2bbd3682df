// If the bridge leaks, a program can settle its own call with a forged value and drain the
// outbox so the host never sees the call (no audit event). It must not get the chance.
let bridge;
try {
  Error.prepareStackTrace = (e, sites) => {
    for (const s of sites) { const f = s.getFunction(); if (f && f.name === "__nous_bridge") bridge = f; }
    return "";
  };
} catch (e) {}
new Error().stack;
try { Error.prepareStackTrace = undefined; } catch (e) {}
const p = tools.echo({real: 1});
let hidden = null;
if (typeof bridge === "function") {
  bridge("settle", 1, true, '{"forged": true}');
  hidden = JSON.parse(bridge("drain")).calls.length;
}
return {echo: await p, hidden};
