// Start 30,000 calls in one step on a 1 s deadline: making them takes about
// that long, so the deadline falls before, during or after their hand-over.
// The host stops handing them over at the deadline, and the refusals it makes
// once the run is over count toward the budget like any other, so the audit
// stays within max_calls + 1 whatever the timing (it was 30,001 events).
const calls = [];
for (let i = 0; i < 30000; i++) calls.push(tools.nope({ i }));
await Promise.allSettled(calls);
return "settled";
