async function f(n) { return await f(n + 1); }
return await f(0);
