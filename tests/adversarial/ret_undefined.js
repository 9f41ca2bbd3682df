return undefined;
