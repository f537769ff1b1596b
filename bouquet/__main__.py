from bouquet.cli import main

main()
