// Getters on Object.prototype that lie about every bridge-ish name.
for (const k of ["res", "rej", "tool", "message", "calls", "logs", "main", "state", "value", "error"]) {
  const d = Object.create(null);
  d.get = function () { return "forged-" + k; };
  d.configurable = true;
  Object.defineProperty(Object.prototype, k, d);
}
const a = await tools.echo({n: 1});
let err;
try { await tools.fail({message: "real message"}); } catch (e) { err = [e.tool, e.message]; }
return {n: a.n, sum: await tools.add({x: 40, y: 2}), err};
