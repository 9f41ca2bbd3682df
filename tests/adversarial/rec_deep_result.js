// Return a 200000-deep object: serialising the result overflows the stack.
let o = {};
for (let i = 0; i < 200000; i++) o = {c: o};
return o;
