return () => 1;
