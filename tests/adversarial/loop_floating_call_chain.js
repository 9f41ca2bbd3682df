// An endless chain of floating calls, each started by the previous one's continuation.
let n = 0;
function again() { n++; tools.echo({n}).then(again); }
again();
return "returned";
