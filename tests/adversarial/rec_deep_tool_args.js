// Pass a 200000-deep object to a tool: serialising the arguments overflows the stack.
let o = {};
for (let i = 0; i < 200000; i++) o = {c: o};
await tools.echo(o);
return "unreachable";
