// Await something nothing will ever settle.
await new Promise(() => {});
