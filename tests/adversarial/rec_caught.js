// A recursion that catches its own overflow: allowed, and it may return normally.
function f(n) {
  try { return f(n + 1); } catch (e) { return "caught deep=" + (n > 100) + " " + e.message; }
}
return f(0);
