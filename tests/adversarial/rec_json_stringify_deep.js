// The program itself stringifies a 200000-deep array.
let o = [];
for (let i = 0; i < 200000; i++) o = [o];
return JSON.stringify(o).length;
