// One huge ArrayBuffer allocation.
const b = new ArrayBuffer(1024 * 1024 * 1024);
return b.byteLength;
