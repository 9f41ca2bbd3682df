// A throwing "then" getter installed while a call is in flight: the settlement makes the
// program's own promise reject, which the program can catch. The host is not involved.
const p = tools.echo({x: 1});
Object.defineProperty(Object.prototype, "then", { get() { throw new Error("then getter"); }, configurable: true });
try { await p; return "resolved"; }
catch (e) { return "caught " + e.message; }
finally { delete Object.prototype.then; }
