// The program catches its own out-of-memory error; the garbage is collectable, so it may go on.
try {
  const a = [];
  while (true) a.push(new Array(1000).fill(1));
} catch (e) {
  return "caught: " + e;
}
