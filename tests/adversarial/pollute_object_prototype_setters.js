// Throwing setters on Object.prototype for every name the bridge could conceivably touch.
// Descriptors are built on null-prototype records, because "value"/"get"/"set" are polluted too.
const names = ["0", "1", "res", "rej", "then", "toJSON", "tool", "message", "calls", "logs",
               "main", "state", "value", "name", "stack", "length", "error", "dropped"];
for (const k of names) {
  const d = Object.create(null);
  d.set = function (v) { throw new Error("setter " + k); };
  d.configurable = true;
  Object.defineProperty(Object.prototype, k, d);
}
const a = await tools.echo({x: 1});
const b = await tools.add({x: 2, y: 3});
let err;
try { await tools.fail({message: "nope"}); } catch (e) { err = [e.tool, e.message, e instanceof ToolError]; }
console.log("logged", {z: 1});
return [a.x, b, err];
