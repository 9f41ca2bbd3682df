// Grow an array without bound.
const a = [];
while (true) a.push([1, 2, 3, 4]);
