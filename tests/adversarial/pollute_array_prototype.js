// Array.prototype methods and iteration replaced; an index accessor that records writes.
const writes = [];
Array.prototype.push = function () { throw new Error("push hijacked"); };
Array.prototype.map = function () { throw new Error("map hijacked"); };
Array.prototype.join = function () { return "hijacked"; };
Array.prototype[Symbol.iterator] = function* () { throw new Error("iterator hijacked"); };
Object.defineProperty(Array.prototype, "5", {
  get() { return "ghost"; },
  set(v) { writes[writes.length] = v; Object.defineProperty(this, "5", {value: v, writable: true, enumerable: true, configurable: true}); },
  configurable: true,
});
const a = await tools.echo({list: [1, 2, 3]});
const b = await tools.add({x: 20, y: 22});
const c = await tools.echo({nested: [[1], [2, [3]]]});
return {len: a.list.length, first: a.list[0], b, nested: c.nested[1][1][0]};
