// Recursion that catches its own stack overflow and recurses again: exponential, never ends.
function f() { try { return f(); } catch (e) { return f(); } }
return f();
