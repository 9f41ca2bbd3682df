// A tool legitimately fails with a message that happens to mention a stack overflow.
// The program did not overflow anything: this is an ordinary uncaught ToolError.
await tools.fail({message: "no answers found on stack overflow"});
