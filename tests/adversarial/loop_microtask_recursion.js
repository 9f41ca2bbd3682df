// setTimeout-less recursion: each microtask queues the next one, forever.
function again() { queueMicrotask(again); }
again();
await new Promise(() => {});
