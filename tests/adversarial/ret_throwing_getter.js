return { fine: 1, get boom() { throw new Error("getter threw"); } };
