return "z".repeat(2000000);
