const realThen = Promise.prototype.then;
Promise.prototype.then = function (f, r) { return realThen.call(this, (v) => f({hijacked: v}), r); };
Promise.reject = () => { throw new Error("reject hijacked"); };
Promise.resolve = () => { throw new Error("resolve hijacked"); };
Promise.all = () => { throw new Error("all hijacked"); };
globalThis.Promise = function () { throw new Error("Promise hijacked"); };
const x = await tools.add({x: 2, y: 2});
let err;
try { await tools.fail({message: "m"}); } catch (e) { err = e.message; }
return [x, err];
