return Promise.reject(new RangeError("rejected result"));
