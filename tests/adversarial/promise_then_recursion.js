// .then recursion: every link resolves to the next one, the chain grows until memory runs out.
function f() { return Promise.resolve().then(f); }
return await f();
