// An object with ever more keys.
const o = {};
let i = 0;
while (true) { o["k" + i] = {i: i}; i++; }
