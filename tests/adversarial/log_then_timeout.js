// Log lines, then loop: the lines written before the kill are kept.
console.log("before");
for (let i = 0; i < 10; i++) console.log("line" + i);
while (true) {}
