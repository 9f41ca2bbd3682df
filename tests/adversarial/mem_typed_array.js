// One huge typed array.
const t = new Float64Array(100 * 1024 * 1024);
return t.length;
