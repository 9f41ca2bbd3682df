Function.prototype.call = function () { throw new Error("call hijacked"); };
Function.prototype.apply = function () { throw new Error("apply hijacked"); };
Function.prototype.bind = function () { throw new Error("bind hijacked"); };
Reflect.apply = function () { throw new Error("Reflect.apply hijacked"); };
String.prototype.slice = function () { return "hijacked"; };
String.prototype.toString = function () { return "hijacked"; };
Object.create = function () { throw new Error("create hijacked"); };
Object.defineProperty = function () { throw new Error("defineProperty hijacked"); };
Object.freeze = function () { throw new Error("freeze hijacked"); };
String = function () { return "hijacked"; };
Error = function () { return {}; };
console.log("line", {n: 1});
const x = await tools.add({x: 3, y: 4});
const y = await tools.echo({s: "text"});
let err;
try { await tools.fail({message: "still a ToolError"}); } catch (e) { err = [e.name, e.message, e instanceof ToolError]; }
return [x, y.s, err];
