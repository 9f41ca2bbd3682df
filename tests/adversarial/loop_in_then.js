// The loop runs inside a promise job; .catch and try/catch try to swallow it.
const p = Promise.resolve(1).then(() => { for (;;) {} });
p.catch((e) => console.log("caught in .catch " + e));
try { await p; } catch (e) { console.log("caught by await " + e); }
return "survived";
