// A busy promise loop: every iteration is a new, short job.
let i = 0;
while (true) { await null; i++; }
