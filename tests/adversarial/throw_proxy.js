// A Proxy whose get and getPrototypeOf traps throw.
throw new Proxy({}, {
  get(t, k) { throw new Error("trap " + String(k)); },
  getPrototypeOf() { throw new Error("proto trap"); },
});
