// Log, then run out of memory: the log line must be kept.
console.log("before oom");
const a = [];
while (true) a.push("y".repeat(1000) + a.length);
