// Values whose toJSON and toString throw, null-prototype objects, symbols, BigInt, functions.
const bad = { toJSON() { throw new Error("no json"); }, toString() { throw new Error("no string"); } };
console.log(bad);
console.log("x", bad, "y");
console.warn(bad);
console.error(new Error("e1"));
console.log(Object.create(null));
console.log(Symbol("s"));
console.log(10n, undefined, null, () => 1);
return "done";
