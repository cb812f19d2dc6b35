from mlm_adapt.cli import main

if __name__ == "__main__":
    main()
