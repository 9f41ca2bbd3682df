// The loop hides in the toJSON of a tool call's arguments.
return await tools.echo({ toJSON() { while (true) {} } });
