// Object.prototype.toJSON changes how the program's own objects serialise: its own call
// arguments become a string, which the host refuses. Nothing else is affected.
Object.prototype.toJSON = function () { return "polluted"; };
try { await tools.echo({x: 1}); return "accepted"; }
catch (e) { return [e.tool, e.message]; }
finally { delete Object.prototype.toJSON; }
