// Try to swallow the interrupt with try/catch around the loop, in a loop.
for (;;) {
  try { while (true) {} } catch (e) { console.log("swallowed " + e); }
}
