// Logging cyclic structures.
const o = {name: "o"}; o.self = o;
const a = [1]; a.push(a);
console.log(o, a);
console.log("after");
return "done";
