// Double a string forever. QuickJS builds ropes, so this hits the engine's string length cap
// (an ordinary, catchable InternalError) before it touches the memory limit.
let s = "x";
while (true) s = s + s;
