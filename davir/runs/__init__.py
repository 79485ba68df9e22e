"""What a run folder holds: its files read with their keys checked (`files`) and its recorded paths (`paths`)."""
