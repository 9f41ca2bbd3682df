// An Error whose message getter throws, and a Proxy whose every trap throws.
const e = new Error("m");
Object.defineProperty(e, "message", { get() { throw new Error("boom"); } });
console.log(e);
const p = new Proxy({}, { get() { throw new Error("trap"); }, ownKeys() { throw new Error("trap"); } });
console.log(p);
return "done";
