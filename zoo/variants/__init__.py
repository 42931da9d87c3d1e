"""Making and checking the files of each variant kind (the kinds themselves: zoo.kinds): make (the files made from
fp32, and retrained ones), opsets (other opsets of the fp32 weights), checks (what validation runs per kind)."""
