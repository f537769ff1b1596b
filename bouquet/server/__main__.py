from bouquet.server.main import main

main()
