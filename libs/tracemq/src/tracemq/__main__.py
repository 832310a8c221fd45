from tracemq.cli import main

main()
