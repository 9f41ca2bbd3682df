// Calls that are never awaited; the program returns at once.
tools.echo({floating: 1});
tools.fail({message: "floating failure"});
return "returned early";
