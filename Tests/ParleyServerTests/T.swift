import Testing; import WSClient; import HummingbirdTesting
