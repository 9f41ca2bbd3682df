// Object.prototype.then turns every object into a thenable: the program fools only itself.
Object.prototype.then = function (resolve) { delete Object.prototype.then; resolve("forged by then"); };
return await tools.echo({x: 1});
