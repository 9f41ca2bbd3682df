// A Map with ever more entries.
const m = new Map();
let i = 0;
while (true) { m.set(i, "v" + i); i++; }
