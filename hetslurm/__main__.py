from hetslurm.cli import main

main()
