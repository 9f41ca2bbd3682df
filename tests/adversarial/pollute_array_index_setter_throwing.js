// A throwing setter on Array.prototype[0]. The program breaks its own arrays, but its tool
// calls go through the prelude's captured JSON intrinsics and should still work.
Object.defineProperty(Array.prototype, "0", { set(v) { throw new Error("index setter"); }, configurable: true });
const sum = await tools.add({x: 1, y: 2});
const echoed = await tools.echo({s: "text"});
return [sum, echoed.s].length === undefined ? "impossible" : sum + ":" + echoed.s;
