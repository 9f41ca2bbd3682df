return 10n;
