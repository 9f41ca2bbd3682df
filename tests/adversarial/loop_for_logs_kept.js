// An infinite for loop after some logging: the logs must survive the kill.
console.log("before the loop");
console.warn("still before");
for (;;) { let x = 1; x++; }
