// An Error subclass whose message getter throws.
class Bad extends Error { get message() { throw new Error("gotcha"); } }
throw new Bad();
