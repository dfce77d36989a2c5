from turnout.cli import main

main()
